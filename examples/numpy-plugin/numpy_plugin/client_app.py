"""An ordinary Flower ClientApp: it knows nothing about fedx."""

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from numpy_plugin.task import accuracy, load_data, train

app = ClientApp()


@app.train()
def train_step(msg: Message, context: Context) -> Message:
    """Train the received arrays and reply with Flower's usual records."""
    x, y = load_data(
        int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    )
    arrays = msg.content["arrays"]
    model = {name: array.numpy() for name, array in arrays.items()}
    loss = train(model, x, y)
    reply = RecordDict(
        {
            "arrays": ArrayRecord({name: Array(array) for name, array in model.items()}),
            "metrics": MetricRecord({"num-examples": len(y), "train-loss": loss}),
        }
    )
    return Message(content=reply, reply_to=msg)


@app.evaluate()
def evaluate_step(msg: Message, context: Context) -> Message:
    """Report the received model's accuracy on this node's data."""
    x, y = load_data(
        int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    )
    model = {name: array.numpy() for name, array in msg.content["arrays"].items()}
    metrics = MetricRecord({"num-examples": len(y), "accuracy": accuracy(model, x, y)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
