"""One process, each Lightning package named on the command line: does its Trainer (and
Fabric) accept DistenvEnvironment from plugins=[...], and does a Trainer whose settings
contradict the launch fail before training, with the values to use?

    python lightning_plugin_check.py lightning pytorch_lightning

Prints one JSON line: {package: {...facts...}}. The contradicting launch is a recorded-style
Open MPI 2-process environment given to DistenvEnvironment(environ=...), so no launcher
is needed for this check (tests/e2e/test_lightning_e2e.py also runs the real thing).
"""
import json
import sys
import warnings

warnings.filterwarnings("ignore")

# The plugin is created before any Lightning import: it must still fit either package.
from distenv import DistEnvError  # noqa: E402
from distenv.lightning import DistenvEnvironment, trainer_kwargs  # noqa: E402

EARLY = DistenvEnvironment()

OMPI_NP2_RANK0 = {
    "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_MCA_orte_num_nodes": "1", "OMPI_MCA_ess_base_jobid": "1234",
    "OMPI_MCA_orte_hnp_uri": "1233.0;tcp://10.0.0.5:4000",
}


def load(pkg):
    if pkg == "lightning":
        import lightning.pytorch as pl
        from lightning.fabric import Fabric
        from lightning.fabric.plugins.environments import ClusterEnvironment
    else:
        import pytorch_lightning as pl
        from lightning_fabric import Fabric
        from lightning_fabric.plugins.environments import ClusterEnvironment
    return pl, Fabric, ClusterEnvironment


def check(pkg):
    import torch

    pl, Fabric, Base = load(pkg)
    facts = {}
    env = DistenvEnvironment()
    facts["isinstance"] = isinstance(env, Base) and isinstance(EARLY, Base)
    common = dict(accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
    trainer = pl.Trainer(plugins=[EARLY], **common, **trainer_kwargs())
    facts["trainer_env"] = type(trainer._accelerator_connector.cluster_environment).__name__
    fabric = Fabric(plugins=[env], accelerator="cpu", **trainer_kwargs())
    facts["fabric_env"] = type(fabric._connector.cluster_environment).__name__

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, _):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
    # devices=1 (single-device strategy: Lightning never consults the environment) and
    # devices=1, strategy="ddp" (Lightning calls validate_settings) on a 2-process launch.
    for label, extra in (("devices1", {}), ("devices1_ddp", {"strategy": "ddp"})):
        two = DistenvEnvironment(environ=OMPI_NP2_RANK0)
        try:
            pl.Trainer(plugins=[two], devices=1, max_steps=1, **common, **extra).fit(Tiny(), data)
            facts[label] = "no error: trained alone"
        except DistEnvError as exc:
            facts[label] = str(exc)
    facts["kwargs_np2"] = trainer_kwargs(environ=OMPI_NP2_RANK0)
    return facts


def main():
    print(json.dumps({pkg: check(pkg) for pkg in sys.argv[1:]}), flush=True)


if __name__ == "__main__":
    main()
