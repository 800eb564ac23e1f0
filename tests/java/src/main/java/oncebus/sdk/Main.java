package oncebus.sdk;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * Runs scenarios with the official Java SDK against {@code oncebus serve} and prints one JSON line for each:
 * {@code {"scenario": name, "ok": true, "result": {...}}} or {@code {"scenario": name, "ok": false, "error": ...}}.
 *
 * <p>Arguments name the scenarios to run (all when none). The servers come from the environment (see {@link Env}).
 * A scenario that needs the driver (tests/java/test_java_sdk.py) to restart the clocked server prints
 * {@code {"request": "restart"}} (or {@code "crash"}: killed, then started again) and reads the server's new
 * connection string from standard input.
 */
public final class Main {
    static final ObjectMapper JSON = new ObjectMapper();
    private static final long SCENARIO_TIMEOUT_SECONDS = 90;
    private static final BufferedReader DRIVER =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));

    /** One scenario: returns what it saw, as JSON-able maps, lists, strings, numbers and booleans. */
    @FunctionalInterface
    interface Scenario {
        Map<String, Object> run(Env env) throws Exception;
    }

    private Main() {
    }

    public static void main(String[] args) throws Exception {
        Env env = Env.fromEnvironment();
        Map<String, Scenario> all = new LinkedHashMap<>();
        DedupScenarios.register(all);
        MessagingScenarios.register(all);
        TransactionScenarios.register(all);
        AdminScenarios.register(all);
        FindingScenarios.register(all);
        WebSocketScenarios.register(all);
        List<String> names = args.length > 0 ? List.of(args) : new ArrayList<>(all.keySet());
        ExecutorService executor = Executors.newCachedThreadPool(runnable -> {
            Thread thread = new Thread(runnable, "scenario");
            thread.setDaemon(true);
            return thread;
        });
        for (String name : names) {
            Scenario scenario = all.get(name);
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("scenario", name);
            long started = System.nanoTime();
            if (scenario == null) {
                line.put("ok", false);
                line.put("error", "no scenario " + name + "; scenarios: " + all.keySet());
            } else {
                Future<Map<String, Object>> future = executor.submit(() -> scenario.run(env));
                try {
                    line.put("result", future.get(SCENARIO_TIMEOUT_SECONDS, TimeUnit.SECONDS));
                    line.put("ok", true);
                } catch (TimeoutException e) {
                    future.cancel(true);
                    line.put("ok", false);
                    line.put("error", "timed out after " + SCENARIO_TIMEOUT_SECONDS + " s");
                } catch (java.util.concurrent.ExecutionException e) {
                    line.put("ok", false);
                    line.put("error", stackTrace(e.getCause()));
                }
            }
            line.put("seconds", (System.nanoTime() - started) / 1e9);
            emit(line);
        }
        executor.shutdownNow();
        System.exit(0);  // the SDK's reactor threads are not all daemons
    }

    static synchronized void emit(Map<String, Object> line) throws IOException {
        System.out.println(JSON.writeValueAsString(line));
        System.out.flush();
    }

    /** Asks the driver to restart the clocked server; returns its new connection string. */
    static String requestRestart() throws IOException {
        return request("restart");
    }

    /** Asks the driver to kill the clocked server (SIGKILL) and start it again; returns its new connection string. */
    static String requestCrash() throws IOException {
        return request("crash");
    }

    private static synchronized String request(String what) throws IOException {
        emit(Map.of("request", what));
        String answer = DRIVER.readLine();
        if (answer == null || answer.isBlank()) {
            throw new IllegalStateException("the driver did not answer the " + what + " request");
        }
        return answer.trim();
    }

    static String stackTrace(Throwable error) {
        StringWriter text = new StringWriter();
        error.printStackTrace(new PrintWriter(text));
        String trace = text.toString();
        return trace.length() > 4000 ? trace.substring(0, 4000) : trace;
    }

    /** What a refusal looked like to the caller: the exception's class, its reason when a ServiceBusException. */
    static Map<String, Object> describe(Throwable error) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("type", error.getClass().getSimpleName());
        if (error instanceof com.azure.messaging.servicebus.ServiceBusException) {
            com.azure.messaging.servicebus.ServiceBusException sb =
                (com.azure.messaging.servicebus.ServiceBusException) error;
            out.put("reason", String.valueOf(sb.getReason()));
            out.put("transient", sb.isTransient());
        }
        if (error instanceof com.azure.core.exception.HttpResponseException) {
            out.put("status", ((com.azure.core.exception.HttpResponseException) error).getResponse().getStatusCode());
        }
        String message = String.valueOf(error.getMessage());
        out.put("message", message.length() > 1500 ? message.substring(0, 1500) : message);
        return out;
    }
}
