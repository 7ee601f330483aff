"""What runs inside the simulation's Ray actors: the ClientApp actor and its start-up.

fedx's backend (:mod:`fedx.simulation.backend`) lives in the simulation's
own process, next to Flower's engine; an actor imports only this module,
Ray, Flower's ClientApp and what the app imports. Flower's own
``ClientAppActor`` sits in the ``flwr.simulation`` package, whose import
every actor would pay before it loads the ClientApp
(:mod:`fedx.flower.clientapp_actor`: what this replaces, and why).
"""

import importlib
from collections.abc import Callable, Sequence

import ray
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedx.flower.clientapp_actor import ClientAppException, LoadClientAppError


@ray.remote
class ClientAppActor:
    """Flower's ``ClientAppActor``: the same arguments, calls and errors.

    Parameters
    ----------
    on_actor_init_fn : callable, optional
        Runs once when the actor starts (the federation config's ``actor``
        options, as in Flower).
    """

    def __init__(self, on_actor_init_fn: Callable[[], None] | None = None) -> None:
        if on_actor_init_fn is not None:
            on_actor_init_fn()

    def run(
        self, client_app_fn: Callable[[], ClientApp], message: Message, cid: str, context: Context
    ) -> tuple[str, Message, Context]:
        """Answer ``message`` with the ClientApp ``client_app_fn`` loads; ``cid`` comes back as given."""
        try:
            app = client_app_fn()
            out_message = app(message=message, context=context)
        except LoadClientAppError:
            raise
        except Exception as ex:  # pylint: disable=broad-exception-caught
            raise ClientAppException(str(ex)) from ex
        return cid, out_message, context

    # pylint: disable-next=too-many-arguments
    def run_group(
        self,
        client_app_fn: Callable[[], ClientApp],
        handler: str,
        messages: list[Message],
        cids: list[str],
        contexts: list[Context],
    ) -> list[tuple[str, Message | ClientAppException, Context]]:
        """Answer a client group's ``messages`` with ``handler`` (``"module:function"``).

        The handler (:func:`fedx.client.groups.train_messages`) gets the
        messages, their contexts and a function that answers one message
        through the ClientApp, and returns each message's reply or error; an
        error comes back as the :class:`ClientAppException` the single call
        would have raised.
        """
        try:
            app = client_app_fn()
            module, _, name = handler.partition(":")
            answer = getattr(importlib.import_module(module), name)
            outcomes = answer(messages, contexts, lambda m, c: app(message=m, context=c))
        except LoadClientAppError:
            raise
        except Exception as ex:  # pylint: disable=broad-exception-caught
            raise ClientAppException(str(ex)) from ex
        return [
            (cid, o if isinstance(o, Message) else ClientAppException(str(o)), context)
            for cid, o, context in zip(cids, outcomes, contexts, strict=True)
        ]

    def terminate(self) -> None:
        """Stop this actor."""
        ray.actor.exit_actor()


def start_actor(
    _actor: object, app_fn: Callable[[], ClientApp] | None, preload: Sequence[str] = ()
) -> str:
    """Run inside a new actor (``__ray_call__``): load the ClientApp and ``preload``; the node's id.

    Loading the ClientApp and what it imports on its first message (torch,
    the task) before the actor joins the pool keeps a cold start out of the
    round that first uses it, and a node that cannot import them out of the
    pool.
    """
    if app_fn is not None:
        app_fn()
    for module in preload:
        importlib.import_module(module)
    return ray.get_runtime_context().get_node_id()
