"""Stage 'notify': send a finished report to Slack or signed webhooks. Nothing here classifies."""
