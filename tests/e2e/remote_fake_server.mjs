// A misbehaving OpenAI-compatible server for tests/e2e/t_remote.sh (loopback only, node's own http).
// The first path segment picks the behaviour, so one server serves every case:
//   /ok/...        a valid stream ("Hello from the fake server.") with usage; each request body is
//                  appended to BODIES (one JSON line) so the test sees what the client sent
//   /malformed/... 200 text/event-stream whose second event is not JSON
//   /auth/...      401 with OpenAI's error JSON (Invalid API Key) unless "Authorization: Bearer sesame"
//   /boom/...      500 with an error JSON
//   /stall/...     200, one piece of text, then nothing (the connection stays open)
//   /cut/...       200, one piece, then the connection ends (no finish_reason, no [DONE])
//   /slow/...      a piece every 200 ms for a minute (for Esc mid-stream)
//   /json/...      200 application/json: a whole chat.completion, as a server that ignores "stream"
// GET /<mode>/v1/models lists "fake-model". Prints "listening PORT" once ready.
import http from 'node:http';
import fs from 'node:fs';

const bodies = process.argv[2];
const chunk = (obj) => `data: ${JSON.stringify(obj)}\n\n`;
const piece = (text) => chunk({ object: 'chat.completion.chunk', model: 'fake-model',
                                 choices: [{ index: 0, delta: { content: text }, finish_reason: null }] });

const server = http.createServer((req, res) => {
    const mode = (req.url.split('/')[1] || '');
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
        if (req.method === 'GET' && req.url.endsWith('/v1/models')) {
            res.writeHead(200, { 'Content-Type': 'application/json' });
            res.end(JSON.stringify({ object: 'list', data: [{ id: 'fake-model', object: 'model' }] }));
            return;
        }
        if (!req.url.endsWith('/v1/chat/completions')) {
            res.writeHead(404, { 'Content-Type': 'application/json' });
            res.end(JSON.stringify({ error: { message: `no route ${req.url}`, type: 'invalid_request_error' } }));
            return;
        }
        const sse = () => res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
        switch (mode) {
        case 'ok':
            if (bodies) fs.appendFileSync(bodies, body.replace(/\n/g, ' ') + '\n');
            sse();
            res.write(piece('Hello from '));
            res.write(piece('the fake server.'));
            res.write(chunk({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }));
            res.write(chunk({ choices: [], usage: { prompt_tokens: 17, completion_tokens: 6, total_tokens: 23,
                                                    prompt_tokens_details: { cached_tokens: 11 } } }));
            res.end('data: [DONE]\n\n');
            break;
        case 'malformed':
            sse();
            res.write(piece('Hello'));
            res.end('data: {"choices": [this is not json\n\n');
            break;
        case 'auth':
            if (req.headers.authorization === 'Bearer sesame') {
                sse();
                res.write(piece('authorized'));
                res.write(chunk({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }));
                res.end('data: [DONE]\n\n');
                break;
            }
            res.writeHead(401, { 'Content-Type': 'application/json' });
            res.end(JSON.stringify({ error: { message: 'Invalid API Key', type: 'authentication_error', code: 401 } }));
            break;
        case 'boom':
            res.writeHead(500, { 'Content-Type': 'application/json' });
            res.end(JSON.stringify({ error: { message: 'the model crashed', type: 'server_error' } }));
            break;
        case 'stall':
            sse();
            res.write(piece('I will now stall'));
            break; // never ends
        case 'cut':
            sse();
            res.write(piece('cut short'));
            setTimeout(() => res.socket.destroy(), 50);
            break;
        case 'json':
            res.writeHead(200, { 'Content-Type': 'application/json' });
            res.end(JSON.stringify({ object: 'chat.completion', choices: [{ index: 0, finish_reason: 'stop',
                                                                            message: { role: 'assistant', content: 'whole' } }] }));
            break;
        case 'slow': {
            sse();
            let i = 0;
            const t = setInterval(() => {
                if (res.destroyed || i++ > 300) { clearInterval(t); res.end(); return; }
                res.write(piece(`word${i} `));
            }, 200);
            res.on('close', () => { clearInterval(t); if (bodies) fs.appendFileSync(bodies, 'CLOSED slow\n'); });
            break;
        }
        default:
            res.writeHead(404, { 'Content-Type': 'application/json' });
            res.end(JSON.stringify({ error: { message: `unknown mode '${mode}'`, type: 'invalid_request_error' } }));
        }
    });
});
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
