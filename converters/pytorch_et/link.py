"""placeholder"""
def link(job, host_et_paths):
    raise NotImplementedError
