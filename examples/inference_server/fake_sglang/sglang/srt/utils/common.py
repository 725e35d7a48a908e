"""What AReaL's launch_server imports from ``sglang.srt.utils.common``."""


def suppress_noisy_warnings() -> None:
    """The stand-in prints nothing noisy."""
