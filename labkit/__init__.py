"""labkit: the measuring kit behind Scaling Lab.

Three sides, kept apart:

* host side (``launch``, ``sweep``, ``site``, ``cli``): starts torchrun, papermill, Quarto;
* rank side (``runtime``, ``timing``, ``workers``, ``solve``): runs inside each torchrun rank;
* pure side (``metrics``, ``model``, ``results``, ``catalog``): numbers in, numbers out, no
  ``torch.distributed``. ``labkit speedup`` and the other pure commands never import torch.
"""

__version__ = "0.1.0"
