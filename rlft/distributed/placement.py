"""The Ray options of `hardware` (cpu_ray, 8gpu, multinode): the learner ranks and the rollout workers as
Ray actors, placed by one placement group.

    driver (rlft train): prompts, rewards, advantages, logging, the loop of rlft.trainer
      |-- learner ranks (learner_actors.py): a torch.distributed group (NCCL on GPUs, gloo on CPU),
      |     trajectories from the Ray object store, data parallel or FSDP2
      |-- rollout workers (rollout_actors.py): an engine each (HF or vLLM), weights broadcast to them
            from learner rank 0 over a group of their own (broadcast.py)

Ray starts here (ray_address=null) or is joined ("auto", "host:port"). Actor output reaches the console
and Ray's log files, linked from the run directory as ray_logs/.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlft.errors import ConfigError, WorkerDied, first_line

# What a test or a user sets in the driver's environment and the actors need too (fault hooks, vLLM knobs).
FORWARDED_ENV_PREFIXES = ("RLFT_", "VLLM_", "WANDB_", "HF_")
CONNECT_TIMEOUT_S = 30.0  # joining a cluster by address


class ActorLost(Exception):
    """A Ray actor died (process exit, node loss, OOM kill) while running a call."""

    def __init__(self, index: int, error: Exception):
        super().__init__(f"actor {index}: {error}")
        self.index, self.error = index, error


def wait_all(refs: list) -> list:
    """ray.get of every ref, but the first actor death is raised at once (as ActorLost with the ref's index),
    not after the survivors' calls, which may wait forever on a collective with the dead one."""
    import ray
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except ray.exceptions.RayActorError as err:
            raise ActorLost(index[ready[0]], err) from err
    return ray.get(refs)


def dead_actors(actors: list, timeout_s: float = 10.0) -> list[int]:
    """Indices of the actors that are gone. One that is alive but busy (blocked in a collective with a
    dead peer) does not answer within the timeout and counts as alive: the caller decides about it."""
    import ray
    dead = []
    for index, actor in enumerate(actors):
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            dead.append(index)
        except ray.exceptions.GetTimeoutError:
            pass
    return dead


@dataclass(frozen=True)
class ActorSetup:
    """What every actor of a run is started with."""
    hardware: object               # rlft.config.hardware.RayHardware
    threads: int                   # torch threads per actor
    seed: int
    bucket_bytes: int              # weight broadcast bucket size


def prepare_actor_process(threads: int) -> None:
    """At the start of an actor: its torch threads, freed memory kept for reuse (as the trainer's process),
    and no per-actor "Loading weights" bars on the console."""
    import torch
    from transformers.utils import logging as hf_logging

    from rlft.tooling.allocator import reuse_freed_memory
    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    reuse_freed_memory()


def actor_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def actor_options(hardware, placement_group, bundle: int, gpus: int) -> dict:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    on_gpu = hardware.device == "cuda"
    strategy = PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=bundle)
    return dict(num_cpus=hardware.cpus_per_actor, num_gpus=gpus if on_gpu else 0, scheduling_strategy=strategy,
                runtime_env={"env_vars": actor_env()})


class RayCluster:
    """Starts or joins Ray, reserves every actor's resources at once, and builds the two sides: learner
    ranks that run `make_learner(group)` (a rlft.types.Learner), rollout workers that run
    `make_engine(seed)` (a rlft.types.RolloutEngine)."""

    def __init__(self, setup: ActorSetup, run_dir: Path, make_learner: Callable, make_engine: Callable, pad_id: int):
        import ray
        from ray.util.placement_group import placement_group

        from rlft.distributed.learner_actors import RemoteLearner
        from rlft.distributed.rollout_actors import RemoteEngine
        h = setup.hardware
        on_gpu = h.device == "cuda"
        learner_bundle = {"CPU": h.cpus_per_actor} | ({"GPU": 1} if on_gpu else {})
        rollout_bundle = {"CPU": h.cpus_per_actor} | ({"GPU": h.gpus_per_rollout_worker} if on_gpu else {})
        bundles = [learner_bundle] * h.learner_ranks + [rollout_bundle] * h.rollout_workers
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            with _sigterm_kept():
                if h.ray_address is None:  # a local instance: CPUs are logical, small machines may oversubscribe
                    needed = sum(b["CPU"] for b in bundles)
                    ray.init(num_cpus=max(needed, os.cpu_count() or 1), include_dashboard=False,
                             log_to_driver=True, configure_logging=False)
                else:
                    join_ray(h.ray_address, timeout_s=min(h.placement_timeout_s, CONNECT_TIMEOUT_S))
        self.placement_group = placement_group(bundles, strategy=h.placement_strategy)
        ready, _ = ray.wait([self.placement_group.ready()], timeout=h.placement_timeout_s)
        if not ready:
            available = ray.available_resources()
            self.shutdown()
            raise ConfigError(f"the Ray cluster could not place {len(bundles)} actors ({bundles[0]} x "
                              f"{h.learner_ranks} learner ranks, {rollout_bundle} x {h.rollout_workers} rollout "
                              f"workers, strategy {h.placement_strategy}) within {h.placement_timeout_s:.0f} s; "
                              f"available: {available}")
        link_ray_logs(run_dir)
        try:
            self.learner = RemoteLearner(setup, make_learner, self.placement_group, bundles=range(h.learner_ranks))
            self.engine = RemoteEngine(setup, make_engine, pad_id, self.placement_group,
                                       bundles=range(h.learner_ranks, len(bundles)), weight_source=self.learner)
        except ActorLost as lost:
            self.shutdown()
            raise WorkerDied(f"a Ray actor died while starting: {lost.error}") from lost
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """Actors stopped mid-task (an interrupt while they load) print C++ stack dumps as their raylet goes;
        those reach the console through Ray's log forwarding: they stay in run_dir/ray_logs instead."""
        import ray
        if not hasattr(self, "placement_group"):
            return
        from ray.util.placement_group import remove_placement_group
        with open(os.devnull, "wb") as sink, _stderr_into(sink):
            for side in ("learner", "engine"):
                if hasattr(self, side):
                    getattr(self, side).kill()
            remove_placement_group(self.placement_group)
            if self.started_ray:
                ray.shutdown()  # joins the thread that forwards actors' output, so nothing comes after


def join_ray(address: str, timeout_s: float) -> None:
    """ray.init(address) retries an unreachable cluster for minutes, and as long a port where something other
    than HTTP/2 answers (the dashboard's, 8265, is a usual slip): a host:port is first asked directly, and any
    failure to join is one ConfigError naming hardware.ray_address."""
    import socket

    import ray
    host, _, port = address.rpartition(":")
    if host and port.isdigit():
        try:
            connection = socket.create_connection((host, int(port)), timeout=timeout_s)
        except OSError as err:
            raise ConfigError(f"hardware.ray_address={address}: no Ray cluster answers there within {timeout_s:.0f} s "
                              f"({err.strerror or err}); start one with `ray start --head`, or ray_address=null "
                              "starts Ray here") from None
        with connection:
            other = _not_grpc(connection, timeout_s)
        if other:
            raise ConfigError(f"hardware.ray_address={address}: not a Ray cluster ({other}; Ray's GCS speaks gRPC, on "
                              "port 6379 unless `ray start --head --port` chose another)")
    # Ray's client retries (20 s for its defaults, longer for an HTTP/2 server that is not Ray's), with C++ log
    # lines on stderr: kept aside, the last one goes into the one error; on success they are shown as they were.
    with tempfile.TemporaryFile() as said:
        try:
            with _stderr_into(said):
                ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            said.seek(0)
            lines = [line for line in said.read().decode(errors="replace").splitlines() if line.strip()]
            last = re.sub(r"^\[[^]]*\]\s*\S+:\d+:\s*", "", lines[-1]) if lines else ""
            reason = first_line(err) + (f"; {last}" if last and "Failed to connect" not in last else "")
            raise ConfigError(f"hardware.ray_address={address}: cannot join the Ray cluster ({reason})") from None
        said.seek(0)
        sys.stderr.write(said.read().decode(errors="replace"))


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # and an empty SETTINGS frame


def _not_grpc(connection, timeout_s: float) -> str | None:
    """What answers on a connection when it is plainly not a gRPC server: its first words, or that it hung up.
    None when it answers in HTTP/2 (a SETTINGS frame), or not in time, or Ray's TLS is on: Ray decides then."""
    import socket
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    connection.settimeout(min(timeout_s, 10.0))
    try:
        connection.sendall(HTTP2_PREFACE)
        head = connection.recv(64)
    except socket.timeout:
        return None
    except OSError as err:
        return f"it hung up ({err.strerror or err})"
    if not head:
        return "it hung up without a word"
    if len(head) >= 4 and head[3] == 0x04:
        return None
    first = head.splitlines()[0].strip()[:40].decode(errors="replace")
    return f"it answered {first!r}"


@contextlib.contextmanager
def _sigterm_kept():
    """ray.init makes SIGTERM sys.exit(15) and adds a C++ handler that prints a stack dump: the driver keeps
    rlft's own (rlft.cli: an interrupt, one line, exit status 130, the actors and Ray stopped on the way out)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if handler is not None:  # None: not set from Python, nothing to keep
            signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def _stderr_into(file):
    """This process's stderr (file descriptor 2: Python's and C++'s lines) goes into `file` for a while."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def link_ray_logs(run_dir: Path) -> None:
    """run_dir/ray_logs -> this Ray session's log folder on this node (every actor's stdout and stderr,
    vLLM's included). On a multi-node cluster each node keeps its actors' logs in its own session folder."""
    import ray
    try:  # the session folder has no public accessor; the link is a convenience, not a requirement
        session = Path(ray._private.worker._global_node.get_session_dir_path())
    except AttributeError:
        return
    link = run_dir / "ray_logs"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(session / "logs", target_is_directory=True)
