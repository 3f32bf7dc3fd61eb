"""``SimilarityCallback`` in a real Lightning ``Trainer``: values with chance levels reach the run directory
and the trainer's TensorBoard and MLflow loggers (each read back); other ranks do nothing."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("lightning")
import lightning.pytorch as pl  # noqa: E402

from simkit.errors import SimkitError  # noqa: E402
from simkit.monitor.lightning import SimilarityCallback  # noqa: E402
from tests.monitor.helpers import tensorboard_events, tiny  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class Classifier(pl.LightningModule):
    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def loader(data, shuffle: bool):
    dataset = torch.utils.data.TensorDataset(data.inputs, data.labels)
    return torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=shuffle,
                                       generator=torch.Generator().manual_seed(0))


def test_a_lightning_trainer_logs_similarity_with_chance_to_run_dir_tensorboard_and_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    net, data = tiny()
    uri = (tmp_path / "mlruns").as_uri()
    tensorboard = TensorBoardLogger(str(tmp_path / "tb"), name="run")
    mlflow = MLFlowLogger(experiment_name="simkit-test", tracking_uri=uri)
    callback = SimilarityCallback(data.inputs[:128], layers="net.blocks.*", every=4, n=128, run_dir=tmp_path / "run",
                                  when="both")
    trainer = pl.Trainer(max_steps=12, logger=[tensorboard, mlflow], callbacks=[callback], accelerator="cpu",
                         devices=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=1, val_check_interval=6, num_sanity_val_steps=1)
    trainer.fit(Classifier(net), loader(data, True), loader(data.take(slice(0, 64)), False))

    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert sorted(set(steps["step"])) == [0, 4, 6, 8, 12]        # start, every 4, validation at 6 (and 12), end
    assert set(steps["layer"]) == {"net.blocks.0", "net.blocks.1", "net.blocks.2"}
    assert np.allclose(steps.loc[steps["step"] == 0, "value"], 1.0)
    assert steps["chance"].abs().max() < 0.05 and steps["beats_chance"].all()
    assert callback.result is not None and callback.result.summary["steps"] == 5
    assert (tmp_path / "run" / "report.html").is_file()
    assert net.training                                                # back in train mode after every measurement

    expected = steps[steps["layer"] == "net.blocks.2"]
    events = tensorboard_events(tensorboard.log_dir)
    scalars = events.Scalars("similarity/unbiased_cka/net.blocks.2")
    assert [e.step for e in scalars] == expected["step"].tolist()
    assert [e.value for e in scalars] == pytest.approx(expected["value"].tolist(), abs=1e-6)
    assert len(events.Scalars("chance/unbiased_cka/net.blocks.2")) == 5
    assert [i.step for i in events.Images("matrix/unbiased_cka")] == [0, 4, 6, 8, 12]

    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(mlflow.run_id, "similarity/unbiased_cka/net.blocks.2")
    assert sorted(m.step for m in history) == expected["step"].tolist()
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(expected["value"].tolist())
    assert len(client.list_artifacts(mlflow.run_id, "similarity")) == 5


def test_only_global_rank_zero_builds_and_feeds_the_monitor():
    net, data = tiny(n=64)
    callback = SimilarityCallback(data.inputs, layers="blocks", n=64)
    other_rank = SimpleNamespace(is_global_zero=False, global_step=0, loggers=[], sanity_checking=False)
    callback.setup(other_rank, net, "fit")
    for hook in (callback.on_train_start, callback.on_train_end, callback.on_fit_end):
        hook(other_rank, net)
    callback.on_train_batch_end(other_rank, net, None, None, 0)
    assert callback.monitor is None and callback.result is None
    rank_zero = SimpleNamespace(is_global_zero=True, global_step=0, loggers=[], sanity_checking=False)
    callback.setup(rank_zero, net, "fit")
    callback.on_train_start(rank_zero, net)
    callback.on_fit_end(rank_zero, net)
    assert callback.result is not None and callback.result.summary["steps"] == 1


def test_a_bad_when_is_refused():
    with pytest.raises(SimkitError, match="`when` must be one of train, validation, both"):
        SimilarityCallback(torch.zeros(8, 1, 40), when="epoch")
