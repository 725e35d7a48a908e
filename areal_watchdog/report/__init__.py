"""Stage 'report': report.json (the contract), report.md and the raw evidence on disk."""
