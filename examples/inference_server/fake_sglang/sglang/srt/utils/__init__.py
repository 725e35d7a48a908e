"""What AReaL's launch_server imports from ``sglang.srt.utils``."""


def kill_process_tree(pid: int, include_parent: bool = True) -> None:
    """The stand-in starts no child processes: nothing to end."""
