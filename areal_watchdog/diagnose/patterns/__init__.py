"""The hang patterns over every process of the job, by what each one does: the rules in their order,
the first that recognises the scene wins (``rules``), with the two stories they tell from more than
stacks: who failed first (``crash``) and storage that stopped answering (``storage``). Pure. A new
pattern belongs here, its place in the order in ``rules``."""
