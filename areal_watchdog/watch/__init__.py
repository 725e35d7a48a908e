"""Sidecar, stage 'watch': one process per node beside the job's ranks. The loop (``sidecar``)
wires the parts (``parts``) over the rooms below them: following progress (``progress``), this
node's processes (``processes``), the sidecars together (``cluster``), looking at a silence
(``silence``) and the timelines of posted incidents (``timelines``); docs/architecture.md."""
