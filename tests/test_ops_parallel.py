"""Tests for fedx.ops.parallel: results in task order, errors raised, thread limits obeyed."""

import threading

import pytest
from threadpoolctl import threadpool_limits

from fedx.ops.parallel import run_tasks, thread_count


def test_results_come_back_in_task_order_from_several_threads():
    def square(value):
        return value * value

    assert run_tasks(square, list(range(50)), threads=2) == [v * v for v in range(50)]
    assert run_tasks(square, [], threads=2) == []
    assert run_tasks(square, [3], threads=4) == [9]


def test_the_first_error_is_raised_after_the_threads_stop():
    def fail_on_seven(value):
        if value == 7:
            raise ValueError("seven")
        return value

    with pytest.raises(ValueError, match="seven"):
        run_tasks(fail_on_seven, list(range(20)), threads=2)


def test_thread_count_follows_the_blas_limit():
    with threadpool_limits(limits=1, user_api="blas"):
        assert thread_count() == 1
        # One thread: everything runs in the calling thread.
        assert run_tasks(lambda _: threading.get_ident(), list(range(5))) == [
            threading.get_ident()
        ] * 5
