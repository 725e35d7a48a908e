"""Prometheus metrics from every sidecar: what they hold (``snapshot``), their names, units and
labels (``families``), and the two ways out, an HTTP endpoint (``http_endpoint``) and
node_exporter's textfile collector (``textfile``), both through ``prometheus_client``
(``exposition``). docs/monitoring.md."""
