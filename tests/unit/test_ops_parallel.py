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
        assert (
            run_tasks(lambda _: threading.get_ident(), list(range(5)))
            == [threading.get_ident()] * 5
        )


def test_a_forked_child_gets_threads_of_its_own():
    """A child forked after the pool started must not hand work to the parent's threads."""
    import multiprocessing  # pylint: disable=import-outside-toplevel

    run_tasks(abs, [-1, -2], threads=2)  # the parent's pool exists now
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        result = pool.apply_async(run_tasks, (abs, [-3, -4, -5]), {"threads": 2})
        assert result.get(timeout=30) == [3, 4, 5]
