import datetime
import os
import time

rank = int(os.environ.get("RANK", 0))
for it in range(1, 6):
    time.sleep(0.3)
    if rank == 1:
        now = datetime.datetime.now()
        print(f" [{now:%Y-%m-%d %H:%M:%S.%f}] iteration {it:8d}/     100 | consumed samples: {it*8:12d} | "
              "elapsed time per iteration (ms): 300.0 | learning rate: 1.000000E-04 | global batch size:     8 | "
              "lm loss: 9.000000E+00 | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | "
              "number of nan iterations:   0 |", flush=True)
time.sleep(3600)
