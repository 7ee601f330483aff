"""Imported by the warm executor's interpreter (:mod:`fedx.deploy.warm_executor`), before it forks tasks.

Each ClientApp task forked from it makes the task's changes to Flower
(:func:`fedx.flower.install` with ``"clientapp-task"``), which first checks
the Flower code they rely on. Here that code is imported and fingerprinted
once, in the warm interpreter: every task finds it done (the check then
costs a task next to nothing, where it would otherwise import that code
first, in every task).
"""

from fedx.flower._installer import prime

prime("clientapp-task")
