"""One 35B-shape route run for memory_cmp.sh: tokens, process CPU, tok/s, peak RSS (a JSON line)."""

import asyncio
import json
import resource
import sys
import time

from edge0.runtime.engine.api import Engine


def hwm_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return 0.0


async def main() -> None:
    path, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    async with Engine.open(path, mode="route", top_k=k, first_layer="wrap", tiers="direct") as eng:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        toks = [t async for t in eng.tokens([1, 2, 3, 4], max_tokens=n, stop=False)]
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        st = eng.last_stats
        assert st is not None
        cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        print(
            json.dumps(
                {
                    "toks": toks,
                    "proc_cpu_s": round(cpu, 2),
                    "request_s": round(t1 - t0, 2),
                    "tps": st.decode_tps,
                    "compute_ms": st.compute_ms_per_step,
                    "blocked_ms": st.blocked_ms_per_step,
                    "hwm_mib": hwm_mib(),
                    "bytes_per_token": st.bytes_per_token,
                }
            )
        )


asyncio.run(main())
