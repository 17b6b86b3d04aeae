"""GPUTapLab: the server extension's settings, its sampler and its hub client."""

from __future__ import annotations

import os

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Int, List, TraitError, Type, Unicode, default, validate

from .gpu import NvmlReader, visible_devices
from .health import HealthMonitor, NvmlHealthCheck
from .hub import HubClient
from .ports import take_local_ports
from .routes import default_handlers
from .sampler import Sampler, utcnow
from .stopping import SCHEMA as STOPPING_SCHEMA


class GPUTapLab(ExtensionApp):
    """Live GPU use, cost and credit, change of GPU and data disks, inside JupyterLab."""

    name = "gputap_lab"
    load_other_extensions = True

    gpu_reader_class = Type(
        default_value=NvmlReader,
        klass=object,
        config=True,
        help="""The class that reads this server's GPUs: built with the list of visible devices
        (or None for all) and asked ``read()`` every sample, in a thread.

            c.GPUTapLab.gpu_reader_class = "gputap_lab.gpu.NvmlReader"
        """,
    )

    gpu_health_class = Type(
        default_value=NvmlHealthCheck,
        klass=object,
        allow_none=True,
        config=True,
        help="""The class that checks this server's GPUs for faults (a lost GPU, uncorrected
        ECC errors, failed row remapping) after each sample, in the sampler's thread, and
        whose findings are reported to the hub (docs/lab.md, "GPU faults"). Built with the
        visible devices, as the reader. None: no health check.

            c.GPUTapLab.gpu_health_class = "gputap_lab.health.NvmlHealthCheck"
        """,
    )

    sample_interval_seconds = Float(
        3.0,
        config=True,
        help="""Seconds between two GPU samples (and between two marks of GPU activity).

            c.GPUTapLab.sample_interval_seconds = 3
        """,
    )

    history_seconds = Float(
        300.0,
        config=True,
        help="""How far back the GPU history (the panel's plot) goes.

            c.GPUTapLab.history_seconds = 300
        """,
    )

    busy_utilization_percent = Int(
        10,
        config=True,
        help="""A GPU at or above this utilisation (its mean since the previous sample) is
        busy, which counts as server activity for the idle culler. A MIG slice on a GPU that
        counts activity per instance (Hopper, Blackwell) is judged the same way by its own
        activity; on other GPUs (A100, A30) see mig_steady_idle_minutes.

            c.GPUTapLab.busy_utilization_percent = 10
        """,
    )

    mig_steady_idle_minutes = Float(
        10.0,
        config=True,
        help="""A MIG slice without activity counters of its own (A100, A30) is busy while
        compute processes hold it (or, where NVML does not list them to this server, memory
        above what the slice held idle) and what they hold changed within this many minutes:
        a context that keeps the same processes and memory this long counts as idle, so an
        idle slice is culled and stops being billed, unless the server's processes keep a
        CPU busy (mig_busy_cpu_percent), as a job feeding the slice does.

            c.GPUTapLab.mig_steady_idle_minutes = 10
        """,
    )

    mig_busy_cpu_percent = Float(
        20.0,
        config=True,
        help="""A MIG slice without activity counters of its own (A100, A30) that something
        holds is busy, however long what it holds stays the same, while the server's own
        processes (kernels, terminals' jobs) use at least this percent of one CPU between
        two samples: a training loop feeding the slice does, a finished context does not.

            c.GPUTapLab.mig_busy_cpu_percent = 20
        """,
    )

    visible_devices = List(
        Unicode(),
        default_value=None,
        allow_none=True,
        config=True,
        help="""The GPU and MIG device UUIDs this server may use; empty for a CPU-only
        server, None for every device NVML shows. Defaults to CUDA_VISIBLE_DEVICES (set by
        the spawner), else the device plugin's NVIDIA_VISIBLE_DEVICES.

            c.GPUTapLab.visible_devices = ["MIG-0c2e…"]
        """,
    )

    simulated = Bool(
        config=True,
        help="""Whether the server's card is simulated (declared, not real): the panel then
        says so and shows no numbers. Defaults to GPUTAP_SIMULATED=1, set by the spawner.

            c.GPUTapLab.simulated = False
        """,
    )

    hub_timeout_seconds = Float(
        20.0,
        config=True,
        help="""Seconds to wait for the hub's server API before answering 502.

            c.GPUTapLab.hub_timeout_seconds = 20
        """,
    )

    @default("visible_devices")
    def _default_visible_devices(self) -> list[str] | None:
        return visible_devices(os.environ)

    @default("simulated")
    def _default_simulated(self) -> bool:
        return os.environ.get("GPUTAP_SIMULATED", "0") == "1"

    @validate(
        "sample_interval_seconds",
        "history_seconds",
        "hub_timeout_seconds",
        "mig_steady_idle_minutes",
        "mig_busy_cpu_percent",
    )
    def _positive(self, proposal):
        if proposal.value <= 0:
            raise TraitError(f"{proposal.trait.name} must be above 0, not {proposal.value}")
        return proposal.value

    @validate("busy_utilization_percent")
    def _percent(self, proposal):
        if not 0 <= proposal.value <= 100:
            raise TraitError(f"busy_utilization_percent must be 0 to 100, not {proposal.value}")
        return proposal.value

    def initialize_settings(self) -> None:
        hub = HubClient.from_env(timeout_seconds=self.hub_timeout_seconds, log=self.log)
        devices = self.visible_devices
        health = None
        if self.simulated or devices == []:
            reader = None
        else:
            reader = self.gpu_reader_class(devices)
            if self.gpu_health_class is not None:
                health = HealthMonitor(
                    self.gpu_health_class(devices), hub, log=self.log, clock=utcnow
                )
        self.sampler = Sampler(
            reader,
            simulated=self.simulated,
            interval_seconds=self.sample_interval_seconds,
            history_seconds=self.history_seconds,
            busy_utilization_percent=self.busy_utilization_percent,
            steady_idle_seconds=60 * self.mig_steady_idle_minutes,
            busy_cpu_percent=self.mig_busy_cpu_percent,
            settings=self.serverapp.web_app.settings,
            log=self.log,
            health=health,
        )
        self.settings["gputap_sampler"] = self.sampler
        self.settings["gputap_health"] = health
        # the hub's announcement that this server stops reaches open pages as an event
        self.serverapp.event_logger.register_event_schema(STOPPING_SCHEMA)
        self.settings["gputap_stopping"] = None
        self.settings["gputap_hub"] = hub
        self.log.info(
            "gputap: GPU %s",
            "simulated"
            if self.simulated
            else "none (CPU-only)"
            if reader is None
            else f"read by {self.gpu_reader_class.__name__} ({devices or 'all devices'})",
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(default_handlers)
        # /proxy/PORT/ reaches this server's own processes only (ports.py)
        take_local_ports(self.serverapp.web_app)

    async def _start_jupyter_server_extension(self, serverapp) -> None:
        self.sampler.start()

    async def stop_extension(self) -> None:
        await self.sampler.stop()
