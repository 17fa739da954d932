"""Stand-ins for what cannot run on a developer machine (AWS, a second host) and scripted
backends for tests; shipped so that users can rehearse their notebooks offline too."""
