// One AG-UI run against a serve, through @ag-ui/client's HttpAgent (tests/test_ui_agui.py,
// through driver.mjs). Given {url, token, threadId, messages, pendingInterrupts, prompt?,
// resume?}; gives {events, messages, pendingInterrupts, error}: every event the client
// received, and the agent's state once the run is over.
import { HttpAgent, randomUUID } from "@ag-ui/client";

export async function aguiRun(given) {
  const agent = new HttpAgent({
    url: given.url,
    headers: given.token ? { Authorization: `Bearer ${given.token}` } : {},
    threadId: given.threadId,
    initialMessages: given.messages ?? [],
  });
  agent.pendingInterrupts = given.pendingInterrupts ?? [];
  if (given.prompt !== undefined) {
    agent.addMessage({ id: randomUUID(), role: "user", content: given.prompt });
  }
  const events = [];
  let error = null;
  try {
    await agent.runAgent(given.resume ? { resume: given.resume } : {}, {
      onEvent({ event }) {
        events.push(event);
      },
    });
  } catch (exc) {
    error = String(exc?.message ?? exc);
  }
  return { events, messages: agent.messages, pendingInterrupts: agent.pendingInterrupts, error };
}
