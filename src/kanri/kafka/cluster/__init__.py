"""KafkaCluster: combined KRaft nodes in a StatefulSet (:mod:`.children`), their state in status (:mod:`.steps`),
the controller (:mod:`.reconciler`)."""
