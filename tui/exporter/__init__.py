"""``anatomy-top exporter``: one node-level Prometheus endpoint for every GPU and every training process.

    discovery   which runtime directories hold hook sockets the exporter may read, and whose they are
    identity    the labels that name one training process's series (run_id, rank), bounded and unique
    families    the metric families of one scrape, built from an NVML reading and the hooks' snapshots
    collector   the prometheus_client collector that reads NVML and the hooks at scrape time
    server      the command line, the listen address and the HTTP endpoint (/metrics)

Knows no widgets and never imports Textual or torch; ``prometheus_client`` (the ``exporter`` extra) is
imported by ``families``, ``collector`` and ``server`` only.
"""
