"""The Ray backend: AReaL's experiment submitted through Ray's Jobs API, a sidecar on every
Ray node placed by Ray itself (docs/ray.md)."""
