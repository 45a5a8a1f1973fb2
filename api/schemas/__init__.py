"""Request and response models of the REST API (field names are a stable contract: docs/api.md)."""
