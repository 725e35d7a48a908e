"""Secrets in the job's own output printed as ``***``, as CI systems do: exact values only, the
longest first, whole lines masked even when ``print`` writes a value in pieces."""

from __future__ import annotations

import io

from areal_watchdog.common.secrets.mask import MASK, Mask, MaskedStream


def test_each_known_value_is_masked_the_longest_first() -> None:
    mask = Mask(["token-abc", "token-abc-extended", "true"])
    assert mask("a=token-abc-extended b=token-abc") == f"a={MASK} b={MASK}"
    assert mask("flag=true") == "flag=true"  # short values would mask ordinary words
    assert Mask()("max_new_tokens=1024") == "max_new_tokens=1024"


def test_a_stream_masks_a_value_written_in_pieces() -> None:
    out = io.StringIO()
    stream = MaskedStream(out, Mask(["s3cr3t-value"]))
    print("key:", "s3cr3t", end="", file=stream)
    assert out.getvalue() == ""  # held until the line is whole
    print("-value done", file=stream)
    stream.writelines(["second s3cr3t-", "value\n"])
    assert out.getvalue() == f"key: {MASK} done\nsecond {MASK}\n"


def test_a_flush_passes_a_partial_line_on_masked() -> None:
    out = io.StringIO()
    stream = MaskedStream(out, Mask(["s3cr3t-value"]))
    stream.write("progress 50% s3cr3t-value")
    stream.flush()
    assert out.getvalue() == f"progress 50% {MASK}"
    assert stream.getvalue() == out.getvalue()  # anything else is the wrapped stream's
