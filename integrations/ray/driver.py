#!/usr/bin/env python
"""Run a training script as the workers of a Ray Train `TorchTrainer`, unchanged.

    python integrations/ray/driver.py --workers 2 examples/pytorch_ddp.py --epochs 1
    python integrations/ray/driver.py --address auto --workers 8 train.py   # a running cluster
    sbatch integrations/ray/ray.sbatch examples/pytorch_ddp.py              # a cluster under SLURM

Every worker runs the script as ``__main__`` with the arguments after it, as `python script`
would. Ray Train has set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
MASTER_ADDR and MASTER_PORT and joined torch's process group before the script starts, so
distenv resolves the launcher "ray" there and `distenv.torch.init_process_group()` returns
the description without a second rendezvous: the examples of examples/ run as they are.
Lightning inside Ray takes Ray's own integration (RayDDPStrategy, RayLightningEnvironment,
prepare_trainer); distenv's plugin says so in one line (docs/platforms.md, Ray).

The script's path must be readable on every node (a shared file system, or Ray's
runtime_env working_dir). Options before the script are the driver's:
--workers N, --gpus (one GPU per worker), --cpus-per-worker C, --address (a running
cluster: "auto" or HOST:PORT; default: start Ray here), --wait-nodes K (wait up to
--wait-seconds for K nodes to join first: an sbatch starts them in the background).
"""
import argparse
import os
import sys
import time


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gpus", action="store_true", help="one GPU per worker")
    ap.add_argument("--cpus-per-worker", type=float, default=1)
    ap.add_argument("--address", default=None, help='a running cluster ("auto", HOST:PORT)')
    ap.add_argument("--num-cpus", type=int, default=None,
                    help="CPUs of the Ray this driver starts (no --address)")
    ap.add_argument("--wait-nodes", type=int, default=0)
    ap.add_argument("--wait-seconds", type=float, default=120)
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    return ap.parse_args(argv)


def run_script(config):
    """Ray Train's training function: the script as __main__ in this worker."""
    import runpy

    script = config["script"]
    sys.argv = [script, *config["args"]]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:  # a script's sys.exit(main()): only a failure is one
        if exc.code not in (None, 0):
            raise RuntimeError(f"{script} exited with {exc.code!r}") from None


def wait_for_nodes(ray, want, seconds):
    deadline = time.monotonic() + seconds
    while True:
        alive = sum(1 for n in ray.nodes() if n.get("Alive"))
        if alive >= want:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"driver.py: {alive} of {want} Ray nodes joined in {seconds:.0f} s. "
                             "Fix: look at the `ray start` lines of the job's output")
        time.sleep(0.5)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus)
    if args.wait_nodes:
        wait_for_nodes(ray, args.wait_nodes, args.wait_seconds)
    trainer = TorchTrainer(
        run_script,
        train_loop_config={"script": os.path.abspath(args.script), "args": args.args},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.gpus,
                                     resources_per_worker={"CPU": args.cpus_per_worker}),
        run_config=RunConfig(name=f"distenv-{os.getpid()}"),
    )
    trainer.fit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
