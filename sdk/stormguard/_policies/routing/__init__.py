"""Which server an attempt goes to: the endpoints a client is given
(``endpoint_config``, ``base_url``, ``deployment``, ``tiers``) and their live state
(``endpoint_state``), the choice among them (``picker``), ejection of a failing one
(``ejection*``), and DNS discovery of the set (``discovery*``, ``dns_name``).
"""
