"""Connection: the ``<name>-connection`` Secret applications read. ``secret`` is the step (the password is written
before the database is created, the endpoint once it is known); its names come from the pure
``kanri.cloud.naming``."""
