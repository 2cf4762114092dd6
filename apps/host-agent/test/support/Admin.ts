/** An admin's JSON call to a coordinator whose URL is known once it has started (`baseUrl()`). */
export const adminCall =
  (baseUrl: () => string, adminToken: string) =>
  (method: string, path: string, body?: unknown): Promise<{ readonly status: number; readonly body: Record<string, unknown> }> =>
    fetch(`${baseUrl()}${path}`, {
      method,
      headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    }).then(async (r) => ({ status: r.status, body: (await r.json()) as Record<string, unknown> }))
