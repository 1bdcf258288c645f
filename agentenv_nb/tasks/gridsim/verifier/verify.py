"""GridSim's verifier: asks the env's grade extension for the submitted schedule's score (0 to 1)."""
import httpx

GRADE_ROUTE = "/agentenv/ext/grade"


async def verify(mcp_url):
    base = mcp_url.rstrip("/").removesuffix("/mcp")
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(base + GRADE_ROUTE, json={})
        response.raise_for_status()
    grade = response.json()
    return [{"id": "schedule", "result": grade["score"] >= 1.0, "score": grade["score"], "description": grade["why"]}]
