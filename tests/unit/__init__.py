"""Tests that need neither a mount nor a JVM: the engine, the namespace and the tools on their own (the fast loop)."""
