"""The messaging operator: KafkaCluster (KRaft brokers) and KafkaTopic (topics grown in checked steps).

Concern folders: ``broker/`` runs one Kafka node (in a pod or as a host process), ``topics/`` holds the topic logic
(pure decisions and thin steps against the admin client), ``api.py`` declares the kinds. See docs/kafka.md.
"""
