"""kanri.cloud: the cloud-resource operator (DatabaseInstance, DatabaseClass). See docs/cloud.md."""
