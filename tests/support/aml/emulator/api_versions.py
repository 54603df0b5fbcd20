"""api-versions Azure documents for Microsoft.MachineLearningServices workspaces' jobs,
environments, computes (what tests assert a client sent).

Sources: the api_version values azure-ai-ml 1.35.2 itself passes to its generated ARM clients
(azure/ai/ml/_ml_client.py ServiceClient* partials; arm_ml_service default "2025-12-01"), and
the stable folders of Azure/azure-rest-api-specs
specification/machinelearningservices/resource-manager/Microsoft.MachineLearningServices/stable
cited in shared/reference/dlts-aml-openpai.md §2.7 (2023-04-01, 2024-04-01).
"""
STABLE = frozenset({"2022-05-01", "2022-10-01", "2023-04-01", "2023-10-01", "2024-04-01", "2025-12-01"})
PREVIEW = frozenset({"2022-02-01-preview", "2022-10-01-preview", "2023-02-01-preview", "2023-04-01-preview",
                     "2023-06-01-preview", "2023-08-01-preview", "2024-01-01-preview", "2024-04-01-preview",
                     "2024-10-01-preview", "2025-01-01-preview"})
DOCUMENTED = STABLE | PREVIEW
