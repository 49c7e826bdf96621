"""The conformance suite: run with ``pytest -p readyq_conformance.plugin --pyargs
readyq_conformance.suite --dburi URL`` (or ``readyq conformance --url URL``).

A dialect author may also ``from readyq_conformance.suite.test_claim import *`` into their
own test tree (with the plugin loaded) and subclass a test class to override one test.
"""
