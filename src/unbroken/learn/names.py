"""The metric names learn reads, as node_exporter and dcgm-exporter publish them, defined once.

Why a table: the readers (OpenMetrics files, Prometheus query_range), the synthetic cluster
(``learn.synth``), the signal builder (``learn.signals``) and the rules writer (``learn.rules``)
must agree on the exact names and on which labels tell two series apart. Everything else in a
series' label set (``job``, ``export``, ``mountaddress``, ``UUID``, ``Hostname``...) is dropped;
series that then collide (two NFS mounts of one node) are summed when the metric is a counter
and averaged when it is a gauge.

The node is the ``instance`` label with any ``:port`` removed; the GPU is the ``gpu`` label; the
NFS operation is the ``operation`` label.
"""

from __future__ import annotations

# node_exporter
INTR = "node_intr_total"                      # counter: interrupts serviced
PROCS = "node_procs_running"                  # gauge: runnable processes
PGPGOUT = "node_vmstat_pgpgout"               # counter (untyped in node_exporter): page-outs
NFS_REQ = "node_mountstats_nfs_operations_requests_total"
NFS_RTT = "node_mountstats_nfs_operations_request_time_seconds_total"
NFS_QUEUE = "node_mountstats_nfs_operations_queue_time_seconds_total"
NFS_SENT = "node_mountstats_nfs_operations_sent_bytes_total"
NFS_RECV = "node_mountstats_nfs_operations_received_bytes_total"
NFS_MAJOR_TIMEOUTS = "node_mountstats_nfs_operations_major_timeouts_total"
NET_RX = "node_network_receive_bytes_total"   # counter; devices are summed (the job's traffic)
# dcgm-exporter
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
MEM_TEMP = "DCGM_FI_DEV_MEMORY_TEMP"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
CLOCK_EVENTS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"   # newer exporters: ..._CLOCKS_EVENT_REASONS
CLOCK_EVENTS_NEW = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
XID = "DCGM_FI_DEV_XID_ERRORS"                 # gauge: the last XID seen on the GPU, 0 if none
REMAP_UNCORR = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
REMAP_CORR = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
POWER = "DCGM_FI_DEV_POWER_USAGE"              # gauge: W
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"              # gauge: MHz
FB_USED = "DCGM_FI_DEV_FB_USED"                # gauge: MiB of GPU memory in use
ECC_SBE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"      # counter: correctable (single-bit) ECC errors
ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"      # counter: uncorrectable (double-bit) ECC errors
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"  # counter: PCIe link replays

#: metrics whose value only grows (rates are taken per scrape)
COUNTERS = frozenset({INTR, PGPGOUT, NFS_REQ, NFS_RTT, NFS_QUEUE, NFS_SENT, NFS_RECV,
                      NFS_MAJOR_TIMEOUTS, NET_RX, ECC_SBE, ECC_DBE, PCIE_REPLAY})
#: per-GPU metrics (the ``gpu`` label is kept)
GPU_METRICS = frozenset({GPU_TEMP, MEM_TEMP, GPU_UTIL, CLOCK_EVENTS, CLOCK_EVENTS_NEW, XID,
                         REMAP_UNCORR, REMAP_CORR, REMAP_FAILURE, REMAP_PENDING, POWER,
                         SM_CLOCK, FB_USED, ECC_SBE, ECC_DBE, PCIE_REPLAY})
#: per-operation NFS metrics (the ``operation`` label is kept)
NFS_METRICS = frozenset({NFS_REQ, NFS_RTT, NFS_QUEUE, NFS_SENT, NFS_RECV, NFS_MAJOR_TIMEOUTS})
ALL = (INTR, PROCS, PGPGOUT, NET_RX, *sorted(NFS_METRICS), *sorted(GPU_METRICS))


def key_label(name: str) -> str:
    """The one label that tells series of ``name`` on one node apart ('' for none)."""
    if name in GPU_METRICS:
        return "gpu"
    if name in NFS_METRICS:
        return "operation"
    return ""


def node_of(instance: str) -> str:
    """``gpu071:9100`` -> ``gpu071`` (an IPv6 ``[::1]:9100`` keeps its brackets' content)."""
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
