"""What a cluster mount's failed write says the cluster stored of it (logfs.cluster.producer._Delivery).

The writer resumes from that text without a duplicate, so it must name every case, including a write the
cluster acknowledged nothing of (an outage before its first answer: CI met it).
"""

from __future__ import annotations

from engine.topic import TopicPartition
from logfs.cluster.producer import _Delivery

TP = TopicPartition("out", 0)


def test_a_write_of_which_nothing_was_acknowledged_says_so() -> None:
    delivery = _Delivery(100, TP)
    delivery.expected = 40          # 60 reported failed, 40 without an answer yet
    text = delivery.accounting()
    assert "acknowledged none of its 100 records of out-0 (resume with record 1 of the write)" in text
    assert "40 records had no answer yet and may still be stored" in text


def test_a_cut_write_names_its_first_records() -> None:
    delivery = _Delivery(100, TP)
    delivery.offsets = [200, 201, 202]
    delivery.expected = 0
    text = delivery.accounting()
    assert "acknowledged 3 of its 100 records at offsets 200-202 of out-0" in text
    assert "resume with record 4 of the write" in text
    assert "no answer" not in text


def test_acknowledgements_out_of_one_run_send_the_writer_to_the_log() -> None:
    delivery = _Delivery(100, TP)
    delivery.offsets = [200, 205]
    delivery.expected = 0
    assert "not one run of its first records: 2 offsets, see the log" in delivery.accounting()
