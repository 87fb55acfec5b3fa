"""placeholder"""
PEERS = {}
def case_specs(devices, tiny): return []
def run(*a): return []
