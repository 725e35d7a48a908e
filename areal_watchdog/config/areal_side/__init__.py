"""What the launcher reads of AReaL itself, without importing it: an AReaL experiment config
(``areal``), the training script a config names and how it is launched (``entrypoint``), and the
traps in an AReaL config that hang later, found before launch (``preflight``). A new AReaL-specific
check belongs here."""
