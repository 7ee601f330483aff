"""The ClientApp's parts: the task a message asks for (:mod:`~fedx.client.task`) and methods' own rounds."""
