"""The pynsq source's options are checked at ``load()``, as Kafka's are, and a
batch read is refused with a sentence that says what to use instead."""

from __future__ import annotations

import pytest


def load_error(spark, **options) -> str:
    reader = spark.readStream.format("pynsq")
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception) as err:
        reader.load()
    return str(err.value)


@pytest.mark.parametrize("options, named", [
    ({"address": "127.0.0.1:4170", "topic": "events"}, "channel"),
    ({"address": "127.0.0.1:4170", "topic": "events", "channel": "c", "maxMesagesPerTrigger": "5"},
     "maxmesagespertrigger"),
    ({"address": "127.0.0.1:4170", "topic": "bad name", "channel": "c"}, "bad name"),
    ({"topic": "events", "channel": "c"}, "address"),
])
def test_a_bad_option_fails_load_naming_it_in_a_few_lines(spark, options, named):
    message = load_error(spark, **options)
    assert named in message.lower()
    assert "UnboundLocalError" not in message
    assert len(message.splitlines()) < 12, message


def test_good_options_load_without_asking_the_broker(spark):
    df = (spark.readStream.format("pynsq").option("address", "127.0.0.1:1")
          .option("topic", "events").option("channel", "c").load())
    assert df.isStreaming and df.columns == ["id", "body", "timestamp", "attempts", "topic",
                                             "channel"]


def test_a_batch_read_is_refused_saying_to_read_a_stream_with_available_now(spark):
    df = (spark.read.format("pynsq").option("address", "127.0.0.1:1")
          .option("topic", "events").option("channel", "c").load())
    with pytest.raises(Exception) as err:
        df.collect()
    message = str(err.value)
    assert 'spark.readStream.format("pynsq")' in message
    assert "trigger(availableNow=True)" in message
