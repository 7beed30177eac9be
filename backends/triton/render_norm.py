def find_online_merges(plan):
    return {}
