"""A monotonic clock the tests advance by hand; sleep() advances it instead of waiting."""


class FakeClock(object):
    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
