"""One Kafka node: its ``server.properties`` (:mod:`.settings`) and the launcher that formats its storage once and
execs the JVM (:mod:`.launch`, ``python -m kanri.kafka.broker``). Standard library only: it runs in the broker's pod."""
