#!/bin/bash
# alternate new (5303cbf) / old (a180573) whole-world runs, batch 1 and 8
out=${OUT:-ab}
mkdir -p $out && out=$(realpath $out)
for i in 1 2; do
  order="new old"; [ $i = 2 ] && order="old new"
  for v in $order; do
    root=${CHECKOUTS:-.}/$v  # git worktrees: new = 5303cbf, old = a180573
    (cd $root && PYTHONPATH=$root ${PYTHON:-python} benchmarks/auto_world.py --batch-sizes 1 8 --prompts 8 --repeats 5 --out $out/$v-$i) > $out/$v-$i.log 2>&1
  done
done
echo done > $out/DONE
