"""Stage 'notify': send a finished report, its follow-ups and its timeline picture to the
team's channels (Slack, Feishu, DingTalk, Microsoft Teams, PagerDuty, signed webhooks, and
sinks of other packages), spooled and retried. Nothing here classifies."""
