"""``python -m simfloat_gpu.campaign.probes PROBE --out DIR``: one probe on its own."""

import sys

from simfloat_gpu.campaign.probes import main

sys.exit(main())
