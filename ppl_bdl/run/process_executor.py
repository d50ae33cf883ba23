"""``DeviceExecutor``: a fit's chains (or an ensemble's members) spread over several devices,
one worker process per device, on this machine.

A backend that runs one stream of work per process (torch: chains one after another on one
device) spreads chains over a device list this way; ``fit`` uses it by itself for such a
backend when ``device=`` names several devices (``["cuda:0", "cuda:1"]``, ``"cuda:*"``, or
the CPU listed twice, ``["cpu", "cpu"]``: :meth:`Backend.process_devices` says which). The
chains are split into one group per device (as equal in size as fit, in order), each group is
``fit(..., chain_ids=group, device=that device)`` in a fresh Python process, and
:func:`ppl_bdl.run.executor.run_job` merges the groups' posteriors: a chain's draws depend only on
the seed and its number, so they are those of the run in one process (bit for bit where the
backend runs chains one after another).

A worker is a new interpreter (``python -m ppl_bdl.run.process_executor``), not a fork (a forked
torch or CUDA runtime is unsafe) and not multiprocessing's "spawn" (which runs the calling
script again in the child: a script that calls ``fit`` at its top level would start its fit
there too). It is sent the job (the bound model with its data, the options) pickled in a file
(by value with ``cloudpickle`` where installed, so a model defined in a script or a notebook
travels too; else by reference: the model's module must be importable), with this process's
``sys.path``; it sends back its group's :class:`~ppl_bdl.run.executor.GroupResult` (the draws, sample
stats and pointwise log-likelihood: :func:`~ppl_bdl.posterior.chains.detach`). The CPU's
processes share its cores: each runs ``cores // (CPU processes)`` threads (at least one).

Faults are handled as :class:`~ppl_bdl.run.ray_executor.RayExecutor` handles them: a worker that
dies (killed, out of memory) is started again from its seed up to ``max_retries`` times; a group
that still fails, or whose fit fails, is named in an :class:`~ppl_bdl.run.executor.ExecutorError`
carrying what the run kept (``error.partial``). Ctrl-C interrupts the workers (each takes one
SIGINT, from the terminal or passed on by this process, keeps the draws it made so far and
sends them back), stops one that has not sent them within
:data:`~ppl_bdl.run.executor.INTERRUPT_GRACE_SECONDS` (or at a second Ctrl-C), and raises
:class:`~ppl_bdl.run.executor.ExecutorInterrupted` with what the run kept.

Example
-------
>>> import ppl_bdl as bdl
>>> bdl.DeviceExecutor(["cpu", "cpu"])
DeviceExecutor(devices=['cpu', 'cpu'], max_retries=0)
"""

from __future__ import annotations

import copyreg
import dataclasses
import importlib
import io
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl.model import Model
from ppl_bdl.errors import ConfigError, InferenceError
from ppl_bdl.inference.loop.driver import progress_bar
from ppl_bdl.run.executor import (
    INTERRUPT_GRACE_SECONDS,
    ChainJob,
    GroupResult,
    portable_options,
    run_detached,
    say_waiting,
    split_chains,
)

#: Seconds between checks for finished workers (Ctrl-C is seen between them).
POLL_SECONDS = 0.1
#: Lines of a dead worker's stderr quoted in its group's failure.
STDERR_LINES = 12


class DeviceExecutor:
    """Runs a fit's chains (an ensemble's members) in one worker process per device:
    ``devices[i]`` runs the i-th group of chains (``fit`` makes one by itself for a backend
    that runs one device per process; pass one, ``fit(..., executor=bdl.DeviceExecutor([...],
    max_retries=2))`` without ``device``, to choose ``max_retries``, or on any backend).

    Parameters
    ----------
    devices : list of str
        One device per worker process, as ``fit``'s ``device=`` names one (``"cuda:1"``,
        ``"cpu"``); a device may be listed more than once (two processes on the CPU).
    max_retries : int
        How many times a group whose worker process died is started again (default 0).

    Each worker is a process of its own on its device. On JAX's GPUs (the NumPyro backend
    spreads chains over a device list in one program, without workers; a DeviceExecutor given
    explicitly runs them anyway) set ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` in the
    environment first: a JAX process takes most of every visible GPU's memory when it starts.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.DeviceExecutor(["cuda:0", "cuda:1"], max_retries=1).devices
    ['cuda:0', 'cuda:1']
    """

    def __init__(self, devices: list[str], max_retries: int = 0):
        if (
            not isinstance(devices, list | tuple)
            or not devices
            or not all(isinstance(d, str) and d for d in devices)
        ):
            raise ConfigError(
                f"devices must be a non-empty list of device names (one worker process each), "
                f"got {devices!r}."
            )
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}.")
        self.devices = list(devices)
        self.max_retries = max_retries

    def __repr__(self) -> str:
        return f"DeviceExecutor(devices={self.devices!r}, max_retries={self.max_retries})"

    def run(self, job: ChainJob) -> list[GroupResult]:
        """Run ``job``'s chains, one group per device, each in its own worker process."""
        per_group = -(-len(job.chains) // len(self.devices))
        groups = split_chains(job.chains, per_group)
        cpus = sum(d.split(":")[0] == "cpu" for d in self.devices[: len(groups)])
        threads = max(1, (os.cpu_count() or 1) // max(cpus, 1))
        with tempfile.TemporaryDirectory(prefix="ppl_bdl_workers_") as tmp:
            folder = Path(tmp)
            (folder / "path.pkl").write_bytes(pickle.dumps(list(sys.path)))
            job = dataclasses.replace(job, options=portable_options(job.options))
            (folder / "job.pkl").write_bytes(_dumps(job))
            workers = [
                _Worker(folder, i, group, self.devices[i], threads)
                for i, group in enumerate(groups)
            ]
            return self._collect(workers, job.progress)

    def _collect(self, workers: list[_Worker], progress: bool) -> list[GroupResult]:
        """Wait for the workers; restart one that died; on Ctrl-C keep those finished and stop
        the others."""
        results: dict[int, GroupResult] = {}
        total = sum(len(w.group) for w in workers)
        bar = progress_bar(total, "chains (worker processes)") if progress else None
        try:
            for worker in workers:
                worker.start()
            while len(results) < len(workers):
                for worker in workers:
                    if worker.index in results or worker.process.poll() is None:
                        continue
                    result = worker.result(self.max_retries)
                    if result is None:  # died, and a retry is left: started again
                        continue
                    results[worker.index] = result
                    if bar is not None:
                        bar.update(len(worker.group))
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            self._interrupt([w for w in workers if w.index not in results], results)
        finally:
            for worker in workers:
                worker.stop()
            if bar is not None:
                bar.close()
        return [results[w.index] for w in workers]

    def _interrupt(self, running: list[_Worker], results: dict[int, GroupResult]) -> None:
        """Ctrl-C: each running worker is interrupted (a SIGINT: it keeps its draws so far and
        sends them back); one that has not within :data:`INTERRUPT_GRACE_SECONDS` (or at a
        second Ctrl-C) is stopped."""
        for worker in running:
            worker.interrupt()
        say_waiting(len(running), "worker processes")
        end = time.monotonic() + INTERRUPT_GRACE_SECONDS
        try:
            while running and time.monotonic() < end:
                for worker in [w for w in running if w.process.poll() is not None]:
                    running.remove(worker)
                    results[worker.index] = worker.result(0, stopped=True)
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:  # a second Ctrl-C: stop them now
            pass
        for worker in running:
            worker.stop()
            results[worker.index] = worker.result(0, stopped=True)


class _Worker:
    """One group's worker process (and its restarts)."""

    def __init__(self, folder: Path, index: int, group: list[int], device: str, threads: int):
        self.folder, self.index, self.group, self.device = folder, index, group, device
        self.threads = threads if device.split(":")[0] == "cpu" else 0
        self.out = folder / f"group{index}.pkl"
        self.log = folder / f"group{index}.err"
        self.tries = 0
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.tries += 1
        cmd = [
            sys.executable,
            "-m",
            __name__,
            str(self.folder),
            str(self.out),
            self.device,
            str(self.threads),
            *map(str, self.group),
        ]
        with open(self.log, "wb") as err:
            self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=err)

    def result(self, retries: int, stopped: bool = False) -> GroupResult | None:
        """The finished worker's result; None when it died and was started again. ``stopped``:
        this process stopped it (Ctrl-C), so without a result its group was cancelled."""
        if self.out.exists():
            return pickle.loads(self.out.read_bytes())
        if stopped:
            return GroupResult(
                self.group,
                reason="cancelled",
                message="interrupted (Ctrl-C); its worker process was stopped",
            )
        if self.tries <= retries:
            self.start()
            return None
        code = self.process.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        tail = self.log.read_text(errors="replace").strip().splitlines()[-STDERR_LINES:]
        said = ("; its last words:\n    " + "\n    ".join(tail)) if tail else ""
        return GroupResult(
            self.group,
            reason="worker died",
            message=(
                f"its worker process on {self.device} ended without a result ({how}) after "
                f"{self.tries - 1} retr{'y' if self.tries == 2 else 'ies'}{said}"
            ),
        )

    def interrupt(self) -> None:
        """Ctrl-C in the worker (it takes the first SIGINT only: one from the terminal too)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _dumps(value) -> bytes:
    """``value`` pickled for a worker: by cloudpickle where installed (a model defined in a
    script or notebook goes by value); else by pickle, with each model a module's top level
    defines sent by reference (:func:`_model_reference`)."""
    try:
        import cloudpickle
    except ImportError:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer)
        pickler.dispatch_table = {**copyreg.dispatch_table, Model: _model_reference}
        pickler.dump(value)
        return buffer.getvalue()
    return cloudpickle.dumps(value)


def _model_reference(model: Model):
    """A ``@bdl.model`` at a module's top level, as plain pickle can send it: by its module and
    name, as pickle sends a function (that name holds the model, so pickle cannot find the
    decorated function under it); any other model by value."""
    module, name = getattr(model.fn, "__module__", None), getattr(model.fn, "__qualname__", "")
    if module not in (None, "__main__") and "<locals>" not in name:
        if _named(module, name, importing=False) is model:
            return _named, (module, name)
    return model.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def _named(module: str, name: str, importing: bool = True):
    """The object ``module.name`` (a dotted name), the module imported when ``importing``;
    None where it is not there."""
    found = importlib.import_module(module) if importing else sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return found


def main(argv: list[str]) -> None:
    """A worker process: ``job.pkl out.pkl device threads chain...``."""
    signal.signal(signal.SIGINT, _interrupt_once)
    folder, out, device, threads, *chains = argv
    sys.path[:] = pickle.loads((Path(folder) / "path.pkl").read_bytes())
    try:
        job = pickle.loads((Path(folder) / "job.pkl").read_bytes())
        if int(threads):  # this process's share of the CPU's cores
            get_backend(job.options.get("backend")).set_threads(int(threads))
        group = [int(c) for c in chains]
        result = run_detached(
            dataclasses.replace(job, options={**job.options, "device": device}), group
        )
    except Exception as err:  # the group's failure, sent back whole where it pickles
        result = GroupResult(
            [int(c) for c in chains],
            reason="error",
            message=f"{type(err).__name__}: {err}",
            error=_picklable(err),
        )
    Path(out + ".part").write_bytes(pickle.dumps(result))
    os.replace(out + ".part", out)  # whole, or not there


def _interrupt_once(signum, frame) -> None:
    """A worker's Ctrl-C: a KeyboardInterrupt the first time (the fit keeps its draws so far
    and the worker sends them back), ignored after (Ctrl-C at the terminal reaches the worker
    and its caller, which passes it on)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _picklable(err: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return InferenceError(f"{type(err).__name__}: {err}")
    return err


if __name__ == "__main__":
    main(sys.argv[1:])
