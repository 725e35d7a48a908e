"""The two chat vendors' signatures (both HMAC-SHA256 of ``"{timestamp}\\n{secret}"``, keyed
differently), shared by the sinks that send them and the tests' stand-ins that check them."""

from __future__ import annotations

import base64
import hashlib
import hmac


def feishu_sign(secret: str, timestamp: int) -> str:
    """Feishu/Lark custom bot: the string is the key, the message is empty; seconds."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk custom robot: the secret is the key, the string the message; milliseconds.
    Base64, before the URL's own encoding."""
    signed = f"{timestamp_ms}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha256).digest()).decode()
