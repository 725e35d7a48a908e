"""Typed reads of config values: a key declared once on its dataclass field with its default, bounds
and doc (``keys``), the checks that raise a ConfigError naming the file, the key and the fix
(``checks``), and a section read as its dataclass declares it (``read``). A new kind of value to
check belongs here."""
