package oncebus.sdk;

import com.azure.core.http.HttpRequest;
import com.azure.core.http.policy.HttpPipelinePolicy;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClient;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClientBuilder;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import reactor.core.publisher.Mono;

/** What the Java SDK does that the Python and JavaScript SDKs do not, where no other scenario shows it. */
final class FindingScenarios {
    private FindingScenarios() {
    }

    static void register(Map<String, Main.Scenario> all) {
        all.put("sdk-version", FindingScenarios::sdkVersion);
        all.put("admin-connection-string-alone", FindingScenarios::adminConnectionStringAlone);
    }

    /** The SDK versions on the class path, as their jars name themselves. */
    private static Map<String, Object> sdkVersion(Env env) throws java.io.IOException {
        Map<String, Object> result = new LinkedHashMap<>();
        for (String name : new String[] {"azure-messaging-servicebus", "azure-core-amqp", "azure-core"}) {
            java.util.Properties properties = new java.util.Properties();
            try (java.io.InputStream in = FindingScenarios.class.getClassLoader()
                     .getResourceAsStream(name + ".properties")) {
                if (in != null) {
                    properties.load(in);
                }
            }
            result.put(name, properties.getProperty("version"));
        }
        result.put("java", System.getProperty("java.specification.version"));
        return result;
    }

    /**
     * The administration client built from the emulator connection string alone: the request it would send (caught
     * before it leaves) goes to {@code https://<host>} without the endpoint's port, signed for that audience.
     */
    private static Map<String, Object> adminConnectionStringAlone(Env env) {
        Map<String, Object> result = new LinkedHashMap<>();
        HttpPipelinePolicy capture = (context, next) -> {
            HttpRequest request = context.getHttpRequest();
            result.put("url", request.getUrl().toString());
            String token = request.getHeaders().getValue(com.azure.core.http.HttpHeaderName.AUTHORIZATION);
            for (String part : token.substring(token.indexOf(' ') + 1).split("&")) {
                if (part.startsWith("sr=")) {
                    result.put("audience", URLDecoder.decode(part.substring(3), StandardCharsets.UTF_8));
                }
            }
            return Mono.error(new IllegalStateException("caught before sending"));
        };
        ServiceBusAdministrationClient admin = new ServiceBusAdministrationClientBuilder()
            .connectionString(env.connectionString).addPolicy(capture).buildClient();
        try {
            admin.getQueue("java-peek");
        } catch (RuntimeException e) {
            result.put("error", e.getMessage());
        }
        result.put("endpointPort", Env.port(env.connectionString));
        return result;
    }
}
