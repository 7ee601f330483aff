"""The test harness: what the tests of both tiers share; no tests here."""
