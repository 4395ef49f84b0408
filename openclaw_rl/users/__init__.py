"""Many people, one deployment: who a request belongs to, and one adapter per person (``docs/users.md``)."""
