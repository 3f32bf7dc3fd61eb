import pytest
from tests.monitor.helpers import tiny, train
from simkit.monitor import Monitor
from tests.monitor.helpers import wandb_history

def test_dbg(tmp_path, monkeypatch):
    import lightning.pytorch  # noqa
    import wandb
    from simkit.monitor import WandbTracker
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="simkit-test", dir=str(tmp_path), mode="offline")
    model, data = tiny()
    monitor = Monitor(model, data, every=3, n=64, trackers=[WandbTracker(run)], images=False)
    train(model, data, 6, monitor.step)
    monitor.close()
    run.finish()
    files = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    print(files)
    print(wandb_history(files[0])[:5])
