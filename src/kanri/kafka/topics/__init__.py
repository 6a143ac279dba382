"""KafkaTopic: what Kafka reports (:mod:`.admin`), the pure decisions (:mod:`.growth`, :mod:`.drift`,
:mod:`.deletion`, :mod:`.ownership`) and the thin steps that act on them (:mod:`.steps`)."""
