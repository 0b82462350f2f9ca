"""The Spark ``logfs`` source started from a consumer group's committed offsets (option ``group``)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.mount]




@pytest.mark.mount_options({"num.partitions": "2", "offsets.topic.num.partitions": "3"})
def test_source_starts_from_the_groups_commits(spark, mount):
    mount.sh("mkdir t && seq 0 9 > t/0/append && seq 0 9 > t/1/append")
    mount.sh("head -c 8 t/0/consume/etl > /dev/null")            # the group consumed offsets 0-3 of partition 0

    def read(**options):
        reader = spark.read.format("logfs").option("path", str(mount.path)).option("subscribe", "t")
        for name, value in options.items():
            reader = reader.option(name, value)
        return sorted((r.partition, r.offset) for r in reader.load().select("partition", "offset").collect())

    assert read(group="etl") == [(0, o) for o in range(4, 10)] + [(1, o) for o in range(10)]
    mount.sh("printf '0 10\\n1 7\\n' > t/groups/etl")
    assert read(group="etl") == [(1, 7), (1, 8), (1, 9)]
    assert read(group="new") == [(p, o) for p in (0, 1) for o in range(10)]   # no commits: the log start
    with pytest.raises(Exception, match="cannot be used together"):
        read(group="etl", startingOffsets="earliest")
