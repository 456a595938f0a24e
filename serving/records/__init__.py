"""What the worker side writes as it works: claims on what it pushes (leases),
every HTTP attempt, drift events, version fingerprints, facts the replicas
reported, its own probes, and where placement put each adapter."""
